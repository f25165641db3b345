"""MkDocs plugin `vramlab-build-speed`: listed first in mkdocs.yml, so it is imported before the others.

mkdocs-jupyter imports nbformat, which imports jsonschema. jsonschema checks the "iri" string
format with rfc3987-syntax when that package is installed (jupyter-events pulls it in through
`jsonschema[format-nongpl]`), and rfc3987-syntax compiles its Lark grammar when imported: about
2.5 s of a 17 s site build on 2 cores. Building the site validates no IRI, so in the mkdocs process
that optional import is made to fail; jsonschema then leaves the "iri" format unchecked, its
documented behaviour without the package. Nothing else changes (the built site is identical).
"""
import sys

from mkdocs.plugins import BasePlugin

sys.modules.setdefault("rfc3987_syntax", None)        # None in sys.modules: `import` raises ImportError


class BuildSpeed(BasePlugin):
    """Does nothing at build time: importing this module is its whole effect."""
