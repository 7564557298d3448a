package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs a single-member etcd via go.etcd.io/etcd/server/v3/embed until
// SIGTERM/SIGINT. It is meant for throwaway test clusters: fsync is off.
func runEtcd() int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	name := fs.String("name", "kvgate-e2e", "member name")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL (listen and advertise)")
	peerURL := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL (listen and advertise)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	noFsync := fs.Bool("unsafe-no-fsync", true, "disable fsync (test clusters only)")
	quota := fs.Int64("quota-backend-bytes", 2<<30, "backend quota in bytes")
	readyTimeout := fs.Duration("ready-timeout", 60*time.Second, "how long to wait for the server to become ready")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	curl, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-client-url: %v\n", err)
		return 2
	}
	purl, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-peer-url: %v\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}
	cfg.UnsafeNoFsync = *noFsync
	cfg.QuotaBackendBytes = *quota
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "5m"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", curl.String())
	case <-time.After(*readyTimeout):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: server took too long to become ready")
		return 1
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: received %v, shutting down\n", s)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: server error: %v\n", err)
		return 1
	}
}
