package testserver

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultTickTime is the ZooKeeper tickTime [StartZooKeeper] uses when
// ZooKeeperOptions.TickTime is 0. ZooKeeper clamps session timeouts to
// 2–20 × tickTime, so 500 ms allows sessions from 1 s to 10 s.
const DefaultTickTime = 500 * time.Millisecond

// ZooKeeperOptions configures [StartZooKeeper]. The zero value is a
// standalone server with tickTime 500 ms on a free loopback port.
type ZooKeeperOptions struct {
	// TickTime is ZooKeeper's basic time unit; it must be a positive whole
	// number of milliseconds. Session timeouts are clamped to 2–20 ×
	// TickTime. 0 means DefaultTickTime (500 ms).
	TickTime time.Duration

	// Port is the client port at 127.0.0.1. 0 (the default) picks a free
	// port, retrying with another one if the server cannot bind it.
	Port int

	// StartTimeout bounds the wait for the server to accept a session, at
	// start and at every Restart (JVM startup takes a few seconds). 0 means
	// DefaultStartTimeout (60 s).
	StartTimeout time.Duration
}

// ZooKeeper is a running standalone ZooKeeper 3.8 server (a java process
// running org.apache.zookeeper.server.quorum.QuorumPeerMain with -Xmx256m)
// listening on 127.0.0.1, with its generated zoo.cfg, log4j/logback
// configuration, data directory (data/) and log (zookeeper.log) in its own
// temporary directory. The AdminServer is disabled; the four-letter words
// ruok, srvr, stat, mntr, conf, cons, envi, wchs and isro are enabled.
//
// Restart waits until the server accepts a session. A Kill keeps the data
// directory: sessions and znodes survive it, as they would a crash.
//
// Its methods are safe for concurrent use.
type ZooKeeper struct {
	host     string // listen address; "" is 127.0.0.1
	port     int
	tickTime time.Duration
	lifecycle
}

// StartZooKeeper starts a standalone ZooKeeper server and returns once it
// completes a session handshake (ConnectRequest/ConnectResponse; the session
// is closed again). On failure it returns an error ending with the tail of
// the log and leaves nothing running or on disk. It fails with an error
// matching [ErrNotInstalled] if java or the ZooKeeper jars are missing.
func StartZooKeeper(opts ZooKeeperOptions) (*ZooKeeper, error) {
	tick, err := tickTime(opts.TickTime)
	if err != nil {
		return nil, err
	}
	timeout, err := checkStart(opts.Port, opts.StartTimeout)
	if err != nil {
		return nil, err
	}
	java, jars, err := zooKeeperInstall()
	if err != nil {
		return nil, err
	}
	dir, err := serverDir("zookeeper", opts.Port)
	if err != nil {
		return nil, err
	}
	if err := writeZKLogConfig(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	z, err := retryBind(opts.Port != 0, func() (*ZooKeeper, error) {
		port := opts.Port
		if port == 0 {
			var err error
			if port, err = pickPort(); err != nil {
				return nil, err
			}
		}
		return tryStartZooKeeper(java, jars, dir, port, tick, timeout)
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return z, nil
}

func tryStartZooKeeper(java string, jars []string, dir string, port int, tick, timeout time.Duration) (*ZooKeeper, error) {
	cfg := fmt.Sprintf(`tickTime=%d
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons,envi,wchs,isro
`, tick/time.Millisecond, filepath.Join(dir, "data"), port)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	// dir comes first so log4j.properties is also found on the classpath.
	classpath := strings.Join(append([]string{dir}, jars...), string(os.PathListSeparator))
	z := &ZooKeeper{port: port, tickTime: tick}
	addr := z.Addr()
	z.srv = &server{
		name:    "zookeeper " + addr,
		bin:     java,
		args:    zkArgs("256m", dir, classpath, cfgPath),
		dir:     dir,
		logPath: filepath.Join(dir, "zookeeper.log"),
		timeout: timeout,
		ready:   func() error { return zkHandshake(addr) },
		ports:   []int{port},
	}
	if err := z.srv.start(); err != nil {
		return nil, err
	}
	return z, nil
}

// writeZKLogConfig writes console-only logging configurations for log4j 1.2
// (Debian's ZooKeeper) and logback (upstream 3.8); the console is the log
// file spawn appends to.
func writeZKLogConfig(dir string) error {
	const log4j = `log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.Target=System.out
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n
`
	const logback = `<configuration>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="CONSOLE"/></root>
</configuration>
`
	if err := os.WriteFile(filepath.Join(dir, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		return fmt.Errorf("testserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "logback.xml"), []byte(logback), 0o644); err != nil {
		return fmt.Errorf("testserver: %w", err)
	}
	return nil
}

// tickTime checks the TickTime option and returns the tick to use.
func tickTime(tick time.Duration) (time.Duration, error) {
	switch {
	case tick == 0:
		return DefaultTickTime, nil
	case tick < time.Millisecond || tick%time.Millisecond != 0:
		return 0, fmt.Errorf("testserver: invalid TickTime %v: must be a positive whole number of milliseconds", tick)
	}
	return tick, nil
}

// zooKeeperInstall returns the java binary and the ZooKeeper jars to run a
// server with (see findJava and zooKeeperJars).
func zooKeeperInstall() (java string, jars []string, err error) {
	if java, err = findJava(); err != nil {
		return "", nil, err
	}
	if jars, err = zooKeeperJars(); err != nil {
		return "", nil, err
	}
	return java, jars, nil
}

// findJava returns $JAVA_HOME/bin/java if it exists, else java from PATH.
func findJava() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		p := filepath.Join(home, "bin", "java")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := lookPath("java", "zookeeper")
	if err != nil {
		return "", &notInstalledError{"testserver: java not found in PATH (ZooKeeper needs it); install it with: apt-get install -y zookeeper (or run scripts/install-servers.sh)"}
	}
	return p, nil
}

// zooKeeperJars returns the jars to put on the classpath:
//
//   - $ZOOKEEPER_HOME/*.jar and $ZOOKEEPER_HOME/lib/*.jar (upstream tarball);
//   - else Debian's /usr/share/java/zookeeper.jar, whose manifest Class-Path
//     names its dependencies in /usr/share/java (this is all Debian's own
//     CLASSPATH holds), plus an slf4j binding (slf4j-log4j12 + log4j 1.2),
//     which the manifest leaves out, so the server's log is not lost;
//   - else /usr/share/zookeeper/*.jar and /usr/share/zookeeper/lib/*.jar.
func zooKeeperJars() ([]string, error) {
	var tried []string
	if home := os.Getenv("ZOOKEEPER_HOME"); home != "" {
		if jars := globJars(filepath.Join(home, "*.jar"), filepath.Join(home, "lib", "*.jar")); hasZooKeeperJar(jars) {
			return jars, nil
		}
		tried = append(tried, "$ZOOKEEPER_HOME="+home)
	}
	const debian = "/usr/share/java/zookeeper.jar"
	if _, err := os.Stat(debian); err == nil {
		jars := []string{debian}
		for _, j := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
			if _, err := os.Stat(j); err == nil {
				jars = append(jars, j)
			}
		}
		return jars, nil
	}
	tried = append(tried, debian)
	if jars := globJars("/usr/share/zookeeper/*.jar", "/usr/share/zookeeper/lib/*.jar"); hasZooKeeperJar(jars) {
		return jars, nil
	}
	tried = append(tried, "/usr/share/zookeeper")
	return nil, &notInstalledError{fmt.Sprintf(
		"testserver: ZooKeeper jars not found (looked in %s); install them with: apt-get install -y zookeeper (or run scripts/install-servers.sh)",
		strings.Join(tried, ", "))}
}

func globJars(patterns ...string) []string {
	var jars []string
	for _, p := range patterns {
		m, _ := filepath.Glob(p)
		jars = append(jars, m...)
	}
	return jars
}

func hasZooKeeperJar(jars []string) bool {
	for _, j := range jars {
		if strings.HasPrefix(filepath.Base(j), "zookeeper") {
			return true
		}
	}
	return false
}

// zkHandshake opens a session with a ConnectRequest, checks the
// ConnectResponse and closes the session again.
func zkHandshake(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	// ConnectRequest: protocolVersion int32, lastZxidSeen int64,
	// timeOut int32 (ms), sessionId int64, passwd buffer, readOnly bool;
	// framed by an int32 length, all big-endian.
	req := binary.BigEndian.AppendUint32(nil, 45)
	req = binary.BigEndian.AppendUint32(req, 0)    // protocolVersion
	req = binary.BigEndian.AppendUint64(req, 0)    // lastZxidSeen
	req = binary.BigEndian.AppendUint32(req, 4000) // timeOut
	req = binary.BigEndian.AppendUint64(req, 0)    // sessionId
	req = binary.BigEndian.AppendUint32(req, 16)   // passwd length
	req = append(req, make([]byte, 16)...)         // passwd
	req = append(req, 0)                           // readOnly
	if _, err := c.Write(req); err != nil {
		return err
	}
	frame, err := ReadZKFrame(c)
	if err != nil {
		return fmt.Errorf("ConnectResponse: %w", err)
	}
	resp := frame[4:]
	// protocolVersion int32, timeOut int32, sessionId int64, passwd buffer.
	if len(resp) < 16 {
		return fmt.Errorf("ConnectResponse too short (%d bytes)", len(resp))
	}
	timeout := int32(binary.BigEndian.Uint32(resp[4:8]))
	session := binary.BigEndian.Uint64(resp[8:16])
	if timeout <= 0 || session == 0 {
		return fmt.Errorf("session refused (timeout %d, session id %#x)", timeout, session)
	}
	// closeSession: RequestHeader{xid int32, type int32 = -11}.
	cl := binary.BigEndian.AppendUint32(nil, 8)
	cl = binary.BigEndian.AppendUint32(cl, 1)
	cl = binary.BigEndian.AppendUint32(cl, uint32(0xFFFFFFF5)) // -11
	if _, err := c.Write(cl); err == nil {
		_, _ = ReadZKFrame(c) // best effort; the session expires anyway
	}
	return nil
}

// ReadZKFrame reads one length-prefixed ZooKeeper frame from r and returns
// it, prefix included; a frame longer than 4 MiB is an error.
func ReadZKFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 4<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, hdr[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		return nil, err
	}
	return frame, nil
}

// Addr returns the client address, "127.0.0.1:PORT".
func (z *ZooKeeper) Addr() string {
	host := z.host
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(z.port))
}

// TickTime returns the server's tickTime; sessions are clamped to 2–20 ×
// TickTime.
func (z *ZooKeeper) TickTime() time.Duration { return z.tickTime }

// Stop sends SIGTERM, waits up to StopGrace (5 s), then sends SIGKILL, waits
// for the JVM to exit and removes Dir. A paused server is resumed so it can
// shut down. Stop is idempotent and safe on a nil *ZooKeeper; after Stop the
// server cannot be restarted.
func (z *ZooKeeper) Stop() error {
	if z == nil {
		return nil
	}
	return z.srv.stop(true)
}

// zkArgs returns java's arguments for a ZooKeeper server with heap limit
// heap, logging to dir, reading its configuration from cfgPath.
func zkArgs(heap, dir, classpath, cfgPath string) []string {
	return []string{
		"-Xmx" + heap,
		"-XX:+UseSerialGC",
		"-XX:-UsePerfData", // no hsperfdata files in /tmp
		"-Djava.awt.headless=true",
		"-Djava.net.preferIPv4Stack=true",
		"-Dzookeeper.log.dir=" + dir,
		"-Dzookeeper.root.logger=INFO,CONSOLE",
		"-Dlog4j.configuration=file:" + filepath.Join(dir, "log4j.properties"),
		"-Dlogback.configurationFile=" + filepath.Join(dir, "logback.xml"),
		"-Dzookeeper.jmx.log4j.disable=true",
		"-cp", classpath,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain",
		cfgPath,
	}
}
