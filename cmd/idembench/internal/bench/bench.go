// Package bench measures what idem costs, side by side with what it
// replaces, in one process on loopback: the logic of cmd/idembench.
//
// Every figure comes from one run. Variants that are compared are measured
// in interleaved batches, so drift of the machine hits them alike, and are
// reported as ratios to the baseline.
package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// Config sizes a run. The zero Config is not useful; start from Defaults.
type Config struct {
	// Requests is the number of requests per client variant.
	Requests int
	// Concurrency is the number of goroutines sending at once in a batch
	// of client requests.
	Concurrency int
	// Batch is the number of requests per variant before the next variant
	// takes its turn.
	Batch int
	// LayerRequests is the number of calls per fake-server variant.
	LayerRequests int
	// StormRequests concurrent requests share one key; StormDelay is the
	// payment's processing time, so that they overlap.
	StormRequests int
	StormDelay    time.Duration
	// Saves is the number of durable saves timed on their own.
	Saves int
	// Intents are the store sizes of the open+list measurement.
	Intents []int
	// Dir is where the file stores are made; "" means os.TempDir. Each run
	// uses a new directory under it and removes it.
	Dir string
}

// Defaults is a full run: under two minutes on two cores.
func Defaults() Config {
	return Config{
		Requests: 3000, Concurrency: 1, Batch: 10, LayerRequests: 20000,
		StormRequests: 1000, StormDelay: 250 * time.Millisecond,
		Saves: 500, Intents: []int{10000, 100000},
	}
}

// Quick is a run of under 20 seconds, for a first look.
func Quick() Config {
	return Config{
		Requests: 500, Concurrency: 1, Batch: 10, LayerRequests: 3000,
		StormRequests: 1000, StormDelay: 250 * time.Millisecond,
		Saves: 100, Intents: []int{10000},
	}
}

// Report is the outcome of a run.
type Report struct {
	Clients ClientReport
	// Layer compares the fake server's bare payment handler, its
	// idempotency layer with fresh keys and with replays, called in
	// process; LoopbackLayer the same through a client on loopback.
	Layer, LoopbackLayer []Result
	Storm                *StormReport
	Saves                SaveReport
	Open                 []OpenReport
	// LoadBefore and LoadAfter are the machine's load averages (1, 5 and
	// 15 minutes, as /proc/loadavg gives them) when the run started and
	// ended; empty where the system does not tell.
	LoadBefore, LoadAfter string
}

// loadAverage returns the 1, 5 and 15 minute load averages, or "".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// IdemRatio is idem(memory)'s p50 latency over plain net/http's.
func (r *Report) IdemRatio() float64 {
	for _, res := range r.Clients.Results {
		if res.Name == "idem(memory)" {
			return res.Ratio
		}
	}
	return 0
}

// Run measures everything cfg asks for. progress, if not nil, gets a line
// as each part starts.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	if progress == nil {
		progress = io.Discard
	}
	progress = &stamped{w: progress, start: time.Now()}
	dir, err := os.MkdirTemp(cfg.Dir, "idembench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep := &Report{LoadBefore: loadAverage()}
	defer func() { rep.LoadAfter = loadAverage() }()

	fmt.Fprintf(progress, "clients: %d requests per variant, concurrency %d\n", cfg.Requests, cfg.Concurrency)
	if err := runClients(ctx, cfg, filepath.Join(dir, "client"), &rep.Clients); err != nil {
		return nil, fmt.Errorf("clients: %w", err)
	}

	fmt.Fprintf(progress, "fake server: %d calls per variant\n", cfg.LayerRequests)
	vs, err := layerVariants()
	if err != nil {
		return nil, fmt.Errorf("fake server: %w", err)
	}
	warm(ctx, vs, 100)
	if rep.Layer, err = interleave(ctx, vs, cfg.LayerRequests, cfg.Batch*4, cfg.Concurrency, 5); err != nil {
		return nil, fmt.Errorf("fake server: %w", err)
	}

	lvs, closeLoop, err := loopbackLayerVariants()
	if err != nil {
		return nil, fmt.Errorf("fake server on loopback: %w", err)
	}
	warm(ctx, lvs, 20)
	rep.LoopbackLayer, err = interleave(ctx, lvs, cfg.Requests, cfg.Batch, cfg.Concurrency, 3)
	closeLoop()
	if err != nil {
		return nil, fmt.Errorf("fake server on loopback: %w", err)
	}

	fmt.Fprintf(progress, "storm: %d requests, one key\n", cfg.StormRequests)
	if rep.Storm, err = storm(ctx, cfg.StormRequests, cfg.StormDelay); err != nil {
		return nil, fmt.Errorf("storm: %w", err)
	}

	fmt.Fprintf(progress, "file store: %d durable saves\n", cfg.Saves)
	if rep.Saves, err = durableSaves(ctx, filepath.Join(dir, "saves"), cfg.Saves); err != nil {
		return nil, fmt.Errorf("durable saves: %w", err)
	}
	for _, n := range cfg.Intents {
		fmt.Fprintf(progress, "file store: open+list of %d intents\n", n)
		o, err := openList(ctx, filepath.Join(dir, fmt.Sprintf("open-%d", n)), n)
		if err != nil {
			return nil, fmt.Errorf("open+list %d: %w", n, err)
		}
		rep.Open = append(rep.Open, o)
	}
	fmt.Fprintf(progress, "removing the stores\n")
	return rep, nil
}

// runClients measures the four client variants against one fake server
// with its idempotency layer.
func runClients(ctx context.Context, cfg Config, dir string, out *ClientReport) error {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	hc := srv.Client()
	if t, ok := hc.Transport.(*http.Transport); ok {
		// Keep one warm connection per sender, as a long-lived app does.
		t.MaxIdleConnsPerHost = max(cfg.Concurrency, http.DefaultMaxIdleConnsPerHost)
	}
	fs, err := persist.OpenDir(dir, nil)
	if err != nil {
		return err
	}
	defer fs.Close()
	fileStore := &countingStore{Store: fs}
	vs, err := clientVariants(hc, srv.URL+"/payments", fileStore)
	if err != nil {
		return err
	}
	out.Concurrency = cfg.Concurrency
	// The variants in memory alternate request by request (a batch is one
	// request per sender), with no pause and no warm-up: they differ by
	// microseconds, and only the closest interleaving lets the machine's
	// drift hit them alike. Each phase is warmed up just before it: the
	// file store's warm-up would leave writeback running into the first.
	mem, file := vs[:3], vs[3:]
	warm(ctx, mem, 20)
	if out.Results, err = interleave(ctx, mem, cfg.Requests, cfg.Concurrency, cfg.Concurrency, 0); err != nil {
		return err
	}
	// The file store's fsyncs and the pauses after them would slow
	// whatever runs next: it is measured on its own, against its own
	// plain baseline.
	warm(ctx, file, 20)
	fileStore.saves.Store(0)
	fileStore.deferred.Store(0)
	fileStore.intents.Store(0)
	fr, err := interleave(ctx, append([]variant{vs[0]}, file...), cfg.Requests, cfg.Batch, cfg.Concurrency, 3)
	if err != nil {
		return err
	}
	out.Results = append(out.Results, fr[1:]...)
	out.FileSaves, out.FileDeferred, out.FileIntents = fileStore.saves.Load(), fileStore.deferred.Load(), fileStore.intents.Load()
	return nil
}

// stamped prefixes each progress line with the time since the start.
type stamped struct {
	w     io.Writer
	start time.Time
}

func (s *stamped) Write(p []byte) (int, error) {
	if _, err := fmt.Fprintf(s.w, "[%5.1fs] %s", time.Since(s.start).Seconds(), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// warm runs each variant n times unmeasured: connections, caches, the
// store's directory.
func warm(ctx context.Context, vs []variant, n int) {
	for _, v := range vs {
		for range n {
			_ = v.do(ctx)
		}
	}
}

// Print writes the report as tables, then, as the last line, the idem
// (memory) over net/http p50 ratio.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "Go %s, %s/%s, GOMAXPROCS %d, %d CPUs\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU())
	if r.LoadBefore != "" {
		fmt.Fprintf(w, "load average (1, 5, 15 min): %s at the start, %s at the end\n", r.LoadBefore, r.LoadAfter)
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "POST /payments on loopback, fresh key per request, concurrency %d\n", r.Clients.Concurrency)
	results(tw, r.Clients.Results, "x net/http")
	tw.Flush()
	fmt.Fprintf(w, "(net/http, retryablehttp and idem(memory) alternate request by request; the idem(file) rows run apart, in batches, their ratios to a net/http measured beside them)\n")
	fmt.Fprintf(w, "idem(file): %d durable writes for %d intents = %.2f per intent on the path the user waits on (target <= 1), %d fsync syscalls each;\n",
		r.Clients.FileSaves, r.Clients.FileIntents, r.Clients.WritesPerIntent(), FsyncsPerSave)
	fmt.Fprintf(w, "  and %d outcomes saved deferred (%.2f per intent): the file's fsync before returning, the directory's in the background\n\n",
		r.Clients.FileDeferred, r.Clients.DeferredPerIntent())

	fmt.Fprintf(w, "fake server, POST /payments called in process (no network)\n")
	results(tw, r.Layer, "x bare")
	tw.Flush()
	fmt.Fprintf(w, "the same on loopback, net/http client\n")
	results(tw, r.LoopbackLayer, "x bare")
	tw.Flush()
	fmt.Fprintln(w)

	s := r.Storm
	fmt.Fprintf(w, "same-key storm: %d concurrent requests, one key, processing %v\n", s.Requests, s.ProcessingDelay)
	fmt.Fprintf(w, "  executions %d (must be 1), 201 fresh: %d, 201 replayed: %d, 409 in progress: %d, other: %d, all answered in %s\n\n",
		s.Executions, s.Created, s.Replayed, s.InProgress, s.Other, dur(s.AllAnswered))

	fmt.Fprintf(w, "file store\n")
	fmt.Fprintf(tw, "durable saves\tper s\tp50\tp99\tfsyncs per save\t\n")
	fmt.Fprintf(tw, "%d\t%.0f\t%s\t%s\t%d\t\n", r.Saves.Saves, r.Saves.PerSecond(), dur(r.Saves.P50), dur(r.Saves.P99), FsyncsPerSave)
	tw.Flush()
	fmt.Fprintf(tw, "intents\tunresolved\trebuild\topen\tlist unresolved\tfirst full scan\theap/intent open\theap/intent scanned\t\n")
	for _, o := range r.Open {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%.0f B\t%.0f B\t\n", o.Intents, o.Unresolved, dur(o.Rebuild), dur(o.Open), dur(o.List), dur(o.Scan), o.HeapOpen, o.HeapScan)
	}
	tw.Flush()
	for _, o := range r.Open {
		fmt.Fprintf(w, "open+list %d intents: %d ms\n", o.Intents, o.Millis())
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "ratio idem(memory)/net-http: %.2f\n", r.IdemRatio())
}

func results(tw *tabwriter.Writer, rs []Result, ratio string) {
	fmt.Fprintf(tw, "variant\trequests\treq/s\tp50\tp99\tallocs/req\tp50 %s\t\n", ratio)
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%.1f\t%.2f\t\n", r.Name, r.Requests, r.RPS, dur(r.P50), dur(r.P99), r.Allocs, r.Ratio)
	}
}

// dur prints d with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	}
}
