"""Transparent interception: TCP the pod's rules redirected to the gateway, decided like CONNECT."""
