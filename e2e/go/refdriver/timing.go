package main

// Timing of the prepare path, for `cargo xtask bench`'s split of kubelet's
// figure: the same parts our driver's `prepare call timings` debug line
// gives (the claim GET, the work after it; kubelet's figure minus the rest
// is the gRPC path). One log line per prepare, as our driver writes.
//
// The helper GETs the claims before it calls PrepareResourceClaims, out of
// this driver's sight, so the GET is timed in the HTTP transport. Only the
// last claim GET is kept: exact for the bench's one-claim calls, the last
// claim's GET for a call with several.

import (
	"net/http"
	"strings"
	"sync"
	"time"
)

// claimGets is the span of the last claim GET made through any transport
// that timedTransport wraps.
type claimGets struct {
	mu    sync.Mutex
	start time.Time
	end   time.Time
}

func (c *claimGets) record(start, end time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start, c.end = start, end
}

// last returns the span of the last claim GET.
func (c *claimGets) last() (time.Time, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start, c.end
}

// wrap is a rest.Config.WrapTransport that times claim GETs into c.
func (c *claimGets) wrap(next http.RoundTripper) http.RoundTripper {
	return &timedTransport{next: next, gets: c}
}

type timedTransport struct {
	next http.RoundTripper
	gets *claimGets
}

func (t *timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/resourceclaims/") {
		t.gets.record(start, time.Now())
	}
	return resp, err
}
