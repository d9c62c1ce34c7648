"""psflow.cli: the ``psflow`` command line.

Classes and functions, by file:

* ``k8s.py`` -- ``psflow k8s render``'s flags and command (the manifests: :mod:`psflow.deploy`).
"""
