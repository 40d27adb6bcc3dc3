"""The pod's interception rules: rendered from settings and policy, applied with nft or iptables."""
