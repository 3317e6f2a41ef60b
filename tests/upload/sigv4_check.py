#!/usr/bin/env python3
"""Recomputes the AWS Signature Version 4 of one captured HTTP request head (argv[1]) from the
secret key (argv[2]), as AWS documents it, for an unsigned payload; prints the expected signature
and the one the request carries."""
import hashlib
import hmac
import re
import sys


def main() -> None:
    head = open(sys.argv[1], "rb").read().decode("latin-1")
    secret = sys.argv[2]
    lines = head.split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    path, _, query = target.partition("?")
    headers = {}
    for line in lines[1:]:
        if not line:
            break
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(" ".join(value.strip().split()))
    auth = headers["authorization"][0]
    m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})", auth)
    if not m:
        sys.exit("unexpected Authorization header: " + auth)
    _, day, region, service, signed, given = m.groups()
    canonical_headers = "".join(f"{h}:{','.join(headers[h])}\n" for h in signed.split(";"))
    canonical = "\n".join([method, path, query, canonical_headers, signed, headers["x-amz-content-sha256"][0]])
    date = headers["x-amz-date"][0]
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    print(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), given)


main()
