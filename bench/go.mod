module github.com/dlock-go/dlock/bench

go 1.25.0

require (
	github.com/bsm/redislock v0.9.4
	github.com/dlock-go/dlock v0.1.0
	github.com/go-redsync/redsync/v4 v4.15.0
	github.com/go-zookeeper/zk v1.0.4
	github.com/redis/go-redis/v9 v9.20.1
	github.com/redis/rueidis v1.0.69
	go.etcd.io/etcd/client/v3 v3.5.27
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.17.0
	gonum.org/v1/plot v0.16.0
	google.golang.org/grpc v1.71.1
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.1.0 // indirect
	codeberg.org/go-pdf/fpdf v0.10.0 // indirect
	git.sr.ht/~sbinet/gg v0.6.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/campoy/embedmd v1.0.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.0 // indirect
	github.com/coreos/go-systemd/v22 v22.3.2 // indirect
	github.com/dlock-go/dlock/etcdlock v0.1.0
	github.com/dlock-go/dlock/zklock v0.1.0
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	go.etcd.io/etcd/api/v3 v3.5.27 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.5.27 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/multierr v1.6.0 // indirect
	golang.org/x/image v0.25.0 // indirect
	golang.org/x/net v0.47.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20250106144421-5f5ef82da422 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250115164207-1a7da9e5054f // indirect
	google.golang.org/protobuf v1.36.4 // indirect
)
