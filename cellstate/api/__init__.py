"""The cellstate gRPC service: wire format, conversions, server and client."""
