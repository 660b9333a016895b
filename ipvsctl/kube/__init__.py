"""The Kubernetes API adapter: the only package that may import the `kubernetes` client.
Its generated API classes are never imported (~20 MB): listwatch makes the list and watch
requests on the client's ApiClient; watch runs one reflector per resource, each object
trimmed as it is decoded and, given the store's Preparer, parsed there too; config finds
the server and the credentials, every file it reads bounded by files."""
