"""``app scale``: step time at 1, 2, 4... ranks, where it goes, and the fitted scaling law."""
