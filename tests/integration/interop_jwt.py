#!/usr/bin/env python3
"""interop_jwt.py KEY CLAIMS HEADERS ALG - a token from PyJWT, for interop.sh.

Prints a token for user 4242, exp = time.time() + 600 (a fractional
NumericDate, as PyJWT writes it), aud "coupons" and iss
"https://id.example", then the JSON object CLAIMS over them (a value null
removes a claim; "nowN" is time.time() + N), with the JSON object HEADERS
as extra JOSE headers, signed with KEY by ALG: HS256, or another name
(e.g. "hs256") registered as HMAC-SHA256, which is what a sloppy issuer
would do. PyJWT is not in the standard library (Debian: python3-jwt), so
this is not tests/testkit.py's.
"""
import json
import sys
import time

import jwt
from jwt.algorithms import HMACAlgorithm

key, over, headers, alg = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
now = time.time()
claims = {"sub": "4242", "exp": now + 600, "aud": "coupons", "iss": "https://id.example"}
for k, v in over.items():
    if isinstance(v, str) and v.startswith("now"):
        v = now + float(v[3:] or 0)
    if v is None:
        claims.pop(k, None)
    else:
        claims[k] = v
if alg != "HS256":
    # A JOSE alg is case-sensitive; PyJWT refuses to write "hs256" unless told
    # it is an HMAC name, which is what a sloppy issuer would do.
    api = jwt.PyJWS()
    api.register_algorithm(alg, HMACAlgorithm(HMACAlgorithm.SHA256))
    print(api.encode(json.dumps(claims).encode(), key, algorithm=alg, headers=headers or None))
else:
    print(jwt.encode(claims, key, algorithm="HS256", headers=headers or None))
