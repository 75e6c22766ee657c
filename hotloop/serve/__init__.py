"""OpenAI-compatible HTTP server and Prometheus metrics.

``api_server`` builds the app and runs uvicorn; ``chat``, ``completions`` and ``native`` hold the
routes; ``openai_protocol`` the request/response bodies; ``params`` turns requests into
``GenerationConfig``; ``jobs`` runs one HTTP request's engine requests; ``gate`` checks keys and
shutdown; ``errors`` shapes every error the OpenAI way; ``metrics`` owns the Prometheus registry.
"""
