"""The shared layer: derivations every kernel kind uses and that know no kind.

Modules here import only each other and attngen.errors / attngen.targets; kinds build on them.
"""
