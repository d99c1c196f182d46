package testserver

// EtcdHTTP lets the package's external tests use the same bounded HTTP client
// as the package itself.
var EtcdHTTP = etcdHTTP
