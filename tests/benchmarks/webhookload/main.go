// webhookload: the API server's side of the webhook benchmark (tests/benchmarks/bench_webhook.py).
//
// Sends AdmissionReview bodies over -concurrency keep-alive HTTPS connections (one per worker,
// workers spread round-robin over -targets, as the API server's pooled connections spread over a
// Service's endpoints), each request with a fresh uid. Go, like the API server, so that the
// client spends little of the CPU it shares with the servers on this machine.
//
// Protocol with the parent: after -warmup requests it prints {"phase":"warm"} and waits for a
// line on stdin; then it sends -requests requests and prints one JSON object with the latencies'
// percentiles, the answers it got and its own CPU seconds over the measured phase.
//
// Standard library only: `go build` / `go run` needs no module download.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The uid in each body file; every request gets its own in its place.
const uidPlaceholder = "00000000-0000-0000-0000-000000000000"

type result struct {
	Requests       int            `json:"requests"`
	Concurrency    int            `json:"concurrency"`
	Targets        int            `json:"targets"`
	WallSeconds    float64        `json:"wall_seconds"`
	P50Ms          float64        `json:"p50_ms"`
	P90Ms          float64        `json:"p90_ms"`
	P99Ms          float64        `json:"p99_ms"`
	MaxMs          float64        `json:"max_ms"`
	MeanMs         float64        `json:"mean_ms"`
	Answers        map[string]int `json:"answers"`
	Errors         int            `json:"errors"`
	FirstError     string         `json:"first_error,omitempty"`
	ClientCPUSecs  float64        `json:"client_cpu_seconds"`
	ThroughputRPS  float64        `json:"throughput_rps"`
	ConnectionsNew int64          `json:"connections_opened"`
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	index := int(p/100*float64(len(sorted)-1) + 0.5)
	return float64(sorted[index]) / 1e6
}

type worker struct {
	client  *http.Client
	target  string
	bodies  [][]byte
	latency []time.Duration
	answers map[string]int
	errors  int
	first   string
}

func (w *worker) send(index int64) {
	template := w.bodies[index%int64(len(w.bodies))]
	uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", index>>32, index&0xffffffffffff)
	body := bytes.Replace(template, []byte(uidPlaceholder), []byte(uid), 1)
	started := time.Now()
	response, err := w.client.Post(w.target, "application/json", bytes.NewReader(body))
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(response.Body)
		response.Body.Close()
	}
	elapsed := time.Since(started)
	w.latency = append(w.latency, elapsed)
	switch {
	case err != nil:
		w.fail(err.Error())
	case response.StatusCode != http.StatusOK:
		w.fail(fmt.Sprintf("HTTP %d: %s", response.StatusCode, answer))
	case !bytes.Contains(answer, []byte(uid)):
		w.fail("the answer does not carry the request's uid: " + string(answer))
	default:
		verdict := "denied"
		if bytes.Contains(answer, []byte(`"allowed": true`)) || bytes.Contains(answer, []byte(`"allowed":true`)) {
			verdict = "allowed"
		}
		if bytes.Contains(answer, []byte(`"warnings"`)) {
			verdict += "+warnings"
		}
		w.answers[verdict]++
	}
}

func (w *worker) fail(message string) {
	w.errors++
	if w.first == "" {
		w.first = message
	}
}

func run(workers []*worker, from, count int64) time.Duration {
	var next atomic.Int64
	next.Store(from)
	end := from + count
	var group sync.WaitGroup
	started := time.Now()
	for _, w := range workers {
		group.Add(1)
		go func(w *worker) {
			defer group.Done()
			for {
				index := next.Add(1) - 1
				if index >= end {
					return
				}
				w.send(index)
			}
		}(w)
	}
	group.Wait()
	return time.Since(started)
}

func main() {
	targets := flag.String("targets", "", "comma-separated webhook URLs (https://127.0.0.1:9443/validate-modeldeployment)")
	caFile := flag.String("ca", "", "CA certificate (PEM) that signed the webhooks' certificate")
	bodyFiles := flag.String("bodies", "", "comma-separated AdmissionReview JSON files, uid "+uidPlaceholder)
	concurrency := flag.Int("concurrency", 50, "keep-alive connections, each with one request in flight")
	requests := flag.Int64("requests", 10000, "measured requests")
	warmup := flag.Int64("warmup", 1000, "requests before the measured ones")
	flag.Parse()

	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhookload: -ca:", err)
		os.Exit(2)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		fmt.Fprintln(os.Stderr, "webhookload: -ca: no PEM certificate in", *caFile)
		os.Exit(2)
	}
	var bodies [][]byte
	for _, name := range strings.Split(*bodyFiles, ",") {
		body, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "webhookload: -bodies:", err)
			os.Exit(2)
		}
		bodies = append(bodies, body)
	}
	urls := strings.Split(*targets, ",")

	var opened atomic.Int64
	workers := make([]*worker, *concurrency)
	for i := range workers {
		dialer := &net.Dialer{Timeout: 10 * time.Second}
		transport := &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 1,
			MaxConnsPerHost:     1,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				opened.Add(1)
				return dialer.DialContext(ctx, network, address)
			},
		}
		workers[i] = &worker{
			client:  &http.Client{Transport: transport, Timeout: 30 * time.Second},
			target:  urls[i%len(urls)],
			bodies:  bodies,
			answers: map[string]int{},
		}
	}

	run(workers, 0, *warmup)
	for _, w := range workers {
		w.latency = w.latency[:0]
		w.answers = map[string]int{}
		w.errors, w.first = 0, ""
	}
	connectionsAfterWarmup := opened.Load()
	fmt.Println(`{"phase":"warm"}`)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil && err != io.EOF {
		fmt.Fprintln(os.Stderr, "webhookload: stdin:", err)
		os.Exit(2)
	}

	cpu := cpuSeconds()
	wall := run(workers, *warmup, *requests)
	cpu = cpuSeconds() - cpu

	var all []time.Duration
	out := result{
		Requests:    int(*requests),
		Concurrency: *concurrency,
		Targets:     len(urls),
		WallSeconds: wall.Seconds(),
		Answers:     map[string]int{},
	}
	var total time.Duration
	for _, w := range workers {
		all = append(all, w.latency...)
		for key, n := range w.answers {
			out.Answers[key] += n
		}
		out.Errors += w.errors
		if out.FirstError == "" {
			out.FirstError = w.first
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for _, d := range all {
		total += d
	}
	out.P50Ms = percentile(all, 50)
	out.P90Ms = percentile(all, 90)
	out.P99Ms = percentile(all, 99)
	out.MaxMs = float64(all[len(all)-1]) / 1e6
	out.MeanMs = float64(total) / float64(len(all)) / 1e6
	out.ClientCPUSecs = cpu
	out.ThroughputRPS = float64(len(all)) / wall.Seconds()
	out.ConnectionsNew = opened.Load() - connectionsAfterWarmup
	encoded, _ := json.Marshal(out)
	fmt.Println(string(encoded))
}
