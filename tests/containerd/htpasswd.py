#!/usr/bin/env python3
"""Print one htpasswd line `USER:$2b$...` (bcrypt, the only hash the distribution registry accepts).

usage: htpasswd.py USER PASSWORD
Uses the C library's crypt(3) through Python's crypt module (libxcrypt on Debian 12 implements bcrypt), so no
Apache tools are needed.
"""
import sys
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import crypt
    except ImportError:
        sys.exit("htpasswd.py: this Python has no crypt module (removed in 3.13); use Python <= 3.12")


def main() -> None:
    if len(sys.argv) != 3 or ":" in sys.argv[1]:
        sys.exit("usage: htpasswd.py USER PASSWORD (USER without ':')")
    user, password = sys.argv[1], sys.argv[2]
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 10))
    if not hashed or not hashed.startswith("$2"):
        sys.exit("htpasswd.py: the C library's crypt does not implement bcrypt")
    print(f"{user}:{hashed}")


if __name__ == "__main__":
    main()
