"""Studies over the twin's public API: each script writes CSV, PNG and summary.md under --out (README.md lists
the commands and the gallery shows what each found)."""
