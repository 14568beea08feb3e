"""The boundaries to the outside world: files, git, the tool's JSON files, archives, the package
index, the project's settings, installed packages."""
