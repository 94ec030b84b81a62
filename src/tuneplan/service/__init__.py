"""Use cases between the faces and the core: job requests, documents, workflows."""
