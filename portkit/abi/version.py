"""The ABI's version: 0.x until all five reference backends pass conformance; then 1.0 and
frozen, and from then on changes are additive (minor) or a new major."""

ABI_VERSION = "0.10"
