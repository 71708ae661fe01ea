"""Reporting of a running worker to its MoEFinetune (``status``), without torch."""
