module github.com/dlock-go/dlock/zklock

go 1.25.0

require (
	github.com/dlock-go/dlock v0.1.0
	github.com/go-zookeeper/zk v1.0.4
)

require go.uber.org/goleak v1.3.0 // indirect
