"""The packed output format: its writer, its manifest and its reader."""
