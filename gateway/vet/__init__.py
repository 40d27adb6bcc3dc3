"""Pure vetting of addresses and URLs: values in, verdicts out; imports nothing of the gateway but `errors`."""
