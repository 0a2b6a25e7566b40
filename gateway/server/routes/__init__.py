"""HTTP routes: the OpenAI-shaped API, operational endpoints, request validation and error bodies."""
