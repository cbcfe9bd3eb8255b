"""The blocking front end: thin shells over ``fencelock._core``."""
