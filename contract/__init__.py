"""The contract every layer shares: request/response models, templates, job payloads, queue names, settings. Imports pydantic, pydantic-settings and orjson only."""
