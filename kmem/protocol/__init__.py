"""Kafka's request and response messages (the APIs a broker needs to serve clients), encoded and
decoded by code generated from Kafka's JSON message schemas (read from the installed kafka-python)."""
from .api import (SUPPORTED_VERSIONS, UNSUPPORTED_VERSION, ApiKey, RequestHeader, ResponseHeader, SplicedSend,
                  api_versions_fallback_response, decode_request, decode_request_header, decode_response,
                  encode_request, encode_response, error_response, message_class, request_header_version,
                  response_header_version)
from .errors import CorruptMessageError, InvalidMessageError, UnknownApiKeyError, UnsupportedVersionError

__all__ = [
    "ApiKey", "SUPPORTED_VERSIONS", "UNSUPPORTED_VERSION", "RequestHeader", "ResponseHeader", "SplicedSend",
    "decode_request_header", "decode_request", "decode_response", "encode_request", "encode_response",
    "error_response", "api_versions_fallback_response", "message_class", "request_header_version", "response_header_version",
    "CorruptMessageError", "InvalidMessageError", "UnknownApiKeyError", "UnsupportedVersionError",
]
