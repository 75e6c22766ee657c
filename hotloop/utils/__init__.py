"""Small helpers shared by every layer; imports nothing else of hotloop."""
