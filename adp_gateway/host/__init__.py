"""The process on its host: CPU priority, huge pages, and what a refused start takes back."""
