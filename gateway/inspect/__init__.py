"""Seeing inside HTTPS for the hosts a policy names (issue 25): the CA, leaves, TLS termination."""
