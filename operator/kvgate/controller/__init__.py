"""Thin trigger handlers, one module per trigger. They do I/O and call the pure modules.

They do not import kopf: ``kvgate.controller.main`` registers them with kopf, and tests drive them
directly
against an API emulator.
"""
