"""The communication report (issue 28): see README.md. Imports nothing (the error pages of `pages` are read by `_errors`)."""
