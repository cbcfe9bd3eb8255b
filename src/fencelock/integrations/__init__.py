"""Integrations with the tools around a lock, each behind its own extra.

- :mod:`fencelock.integrations.otel` (extra ``otel``): OpenTelemetry metrics and spans.
- :mod:`fencelock.integrations.celery` (extra ``celery``): at most one running instance of a
  Celery task per name and arguments.
- :mod:`fencelock.integrations.django` (extra ``django``): a client from settings, ``locked``,
  and the ORM storage guard (``FenceField``, ``fenced_update``).

Importing this package imports neither tool.
"""
