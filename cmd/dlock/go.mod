module github.com/dlock-go/dlock/cmd/dlock

go 1.25.0

require (
	github.com/dlock-go/dlock v0.1.0
	github.com/dlock-go/dlock/etcdlock v0.1.0
	github.com/dlock-go/dlock/pglock v0.1.0
	github.com/dlock-go/dlock/zklock v0.1.0
	github.com/go-zookeeper/zk v1.0.4
	github.com/jackc/pgx/v5 v5.12.0
	github.com/prometheus/client_golang v1.23.2
	github.com/redis/go-redis/v9 v9.20.1
	github.com/spf13/cobra v1.10.2
	go.etcd.io/etcd/client/v3 v3.5.27
	go.opentelemetry.io/otel/sdk/metric v1.41.0
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.17.0
	golang.org/x/sys v0.41.0
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.67.5 // indirect
	github.com/prometheus/otlptranslator v1.0.0 // indirect
	github.com/prometheus/procfs v0.19.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.41.0 // indirect
	go.opentelemetry.io/otel/metric v1.41.0 // indirect
	go.opentelemetry.io/otel/sdk v1.41.0 // indirect
	go.opentelemetry.io/otel/trace v1.41.0 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.0 // indirect
	github.com/coreos/go-systemd/v22 v22.3.2 // indirect
	github.com/dlock-go/dlock/dlockotel v0.1.0
	github.com/dlock-go/dlock/verify v0.1.0
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.etcd.io/etcd/api/v3 v3.5.27 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.5.27 // indirect
	go.opentelemetry.io/otel/exporters/prometheus v0.63.0
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/multierr v1.6.0 // indirect
	golang.org/x/net v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20250106144421-5f5ef82da422 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250115164207-1a7da9e5054f // indirect
	google.golang.org/grpc v1.71.1
	google.golang.org/protobuf v1.36.11 // indirect
)
