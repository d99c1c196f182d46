// Package testserver starts real redis-server, etcd, ZooKeeper and
// PostgreSQL processes on free loopback ports, each in its own temporary
// directory, for tests and for demos. It never mocks a server: every Start function returns only after the
// server answers its own protocol (Redis PING over RESP, etcd GET /health,
// a ZooKeeper session handshake), or an error that ends with the tail of the
// server's log.
//
// The package uses only the standard library and does not depend on package
// testing, so it can be used from TestMain, from tests and from ordinary
// binaries. Every function returns errors instead of failing a test.
//
// # Binaries
//
// redis-server, etcd and java are looked up in PATH. The ZooKeeper jars are
// taken from $ZOOKEEPER_HOME (an upstream tarball layout: *.jar and lib/*.jar),
// else from Debian's /usr/share/java/zookeeper.jar (package libzookeeper-java,
// pulled in by package zookeeper), else from /usr/share/zookeeper. A missing
// binary yields an error that matches [ErrNotInstalled] and names the Debian
// package to install; scripts/install-servers.sh installs all of them.
//
// # Process lifetime
//
// Servers are stopped by PID, never by process name. Stop sends SIGTERM,
// waits up to [StopGrace] (5 s) and then sends SIGKILL; Kill sends SIGKILL at
// once. Both wait until the process has exited. Every kind of server has the
// same process methods (PID, Dir, LogFile, Kill, Restart, Pause, Resume),
// one implementation shared by all; what a Restart waits for and what
// survives a Kill is in each kind's doc.
//
// On Linux every server is started with Pdeathsig = SIGKILL, so it is killed
// when the process that started it dies, even by SIGKILL (for example when
// `go test -timeout` kills a hung test binary). Pdeathsig fires when the OS
// thread that forked the child exits, not the process, so all servers are
// forked from one goroutine locked to its OS thread for as long as any server
// started by this package is alive; when the last one has exited, that
// goroutine unlocks and ends, leaving no goroutines behind (which keeps
// goroutine-leak checks in TestMain clean once every server is stopped).
//
// Every server also runs in its own process group (Setpgid). A Ctrl-C in a
// terminal therefore reaches only the test binary, which decides how to stop
// its servers (and if it just dies, Pdeathsig kills them). SIGKILL, SIGSTOP
// and SIGCONT are sent to the whole group, so helper processes a server forks
// (such as a Redis background save) are killed, paused and resumed with it.
// On Unix systems other than Linux there is no Pdeathsig: servers outlive a
// parent that is killed without stopping them. Pause and Resume are not
// supported on Windows.
//
// # Topologies
//
// Besides single servers: [StartSentinel] and [StartReplicatedSentinel]
// (a primary, replicas and three sentinels), [StartCluster] and
// [StartReplicatedCluster] (Redis Cluster without and with replicas),
// [StartEtcdCluster] and [StartZooKeeperEnsemble]. Each returns once the
// deployment can fail over (replicas in sync, sentinels agreeing on a
// quorum, a leader elected) and names its current primary or leader, so a
// test can kill or pause that one. [StartPartitionableEtcdCluster] and
// [StartPartitionableZooKeeperEnsemble] run each member, and
// [StartPartitionableSentinel] each data node (its sentinels stay on
// loopback), in its own network namespace behind a bridge, so a member can
// be cut off from the others and from every client and reconnected
// (Partition, Heal); they need Linux, root and the ip command, and fail
// with an error matching [ErrNoNetNS] otherwise.
//
// # Ports
//
// A port of 0 means "pick a free loopback port": the package listens on
// 127.0.0.1:0, reads the port and closes the listener, and never hands the
// same port out twice in one process. If a server still fails to bind
// (another process took the port in between), Start retries with fresh ports.
// Ports given explicitly are used as they are, without retries.
package testserver
