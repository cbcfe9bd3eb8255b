"""The asyncio front end: thin shells over ``fencelock._core``."""
