"""Outbound secret scanning: pure matchers over bytes, findings without the matched text."""
