"""What crosses the wire between hetswarm peers.

 * errors.py - HetswarmError, the base of every expected failure, and RejectedInput for bad input
"""
