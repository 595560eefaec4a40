"""portkit's own backends, one package each, registered like any third-party backend."""
