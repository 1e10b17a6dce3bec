"""One module per paper: its experiments, registered on import (wansync.reproduce.registry)."""
