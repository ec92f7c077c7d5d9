"""``python -m tasks.config``: print the configuration table of docs/configuration.md."""

from tasks.config.table import settings_table

print(settings_table())
