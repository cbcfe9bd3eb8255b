"""A Django app for tests/integration/test_django.py: one model with a fence field."""
