"""What the cluster commands (kvgate explain, history, rollback) decide from what they read.

Pure: the objects read from the API in, plain data out.
"""
