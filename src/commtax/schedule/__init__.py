"""How ops overlap in time: the Breakdown record, the analytical schedule and the event simulator (``sim``)."""
