"""A refund agent: a safe read and a keyed side effect against a payments API."""
