"""Controller machinery on top of lightkube: informers, a work queue, leader election."""
