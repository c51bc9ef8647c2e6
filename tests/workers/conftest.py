"""The test Workers hold no tests of their own: pytest does not look into their
python_modules/ (links to the kit's, made by served_worker.link_python_modules, whose
vendored packages ship tests of their own, e.g. certifi's)."""

collect_ignore_glob = ["*/python_modules"]
