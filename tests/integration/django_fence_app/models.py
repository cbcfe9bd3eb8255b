from __future__ import annotations

from django.db import models

from fencelock.integrations.django import FenceField, FenceTokenField


class Account(models.Model):
    name = models.CharField(max_length=50)
    balance = models.IntegerField(default=0)
    fence = FenceField()

    class Meta:
        app_label = "django_fence_app"


class TokenAccount(models.Model):
    """An account guarded with the lease's token beside the fence, and tombstones."""

    name = models.CharField(max_length=50)
    balance = models.IntegerField(default=0)
    fence = FenceField()
    fence_token = FenceTokenField()
    deleted = models.BooleanField(default=False)

    class Meta:
        app_label = "django_fence_app"
