from __future__ import annotations

from django.apps import AppConfig


class FenceAppConfig(AppConfig):
    name = "django_fence_app"
    default_auto_field = "django.db.models.BigAutoField"
