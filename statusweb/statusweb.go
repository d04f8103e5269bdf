// Package statusweb serves the scheduler's status page (FPT_STATUS_ADDR):
// a page that renders the cluster's status.Snapshot and fetches it again
// every second, and the snapshot itself as /status.json. The page and its
// chart library (uPlot, MIT, vendored by scripts/vendor-uplot.sh) are
// embedded in the binary: viewing it asks nothing of any other host.
package statusweb

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"

	"github.com/fptps/fpt/httpserve"
	"github.com/fptps/fpt/status"
)

//go:embed assets
var assets embed.FS

// Handler serves the page at / and board's latest snapshot at
// /status.json.
func Handler(board *status.Board) http.Handler {
	files, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(files))
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err := json.NewEncoder(w).Encode(board.Latest()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	return mux
}

// ListenAddr is the address to listen on for addr ("host:port", ":port",
// port 0 for any free one) under the nodes' binding rule: with
// loopbackOnly (no cluster secret and no FPT_INSECURE, where the nodes
// bind only loopback) an empty host becomes 127.0.0.1 and any host that
// is not a loopback address is refused.
func ListenAddr(addr string, loopbackOnly bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("FPT_STATUS_ADDR=%s: %w", addr, err)
	}
	if !loopbackOnly {
		return addr, nil
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		return "", fmt.Errorf("FPT_STATUS_ADDR=%s: without FPT_CLUSTER_SECRET (or FPT_INSECURE=1) the status page is served on loopback only, as the nodes listen", addr)
	}
	return addr, nil
}

// Server serves the status page until Close.
type Server struct{ *httpserve.Server }

// Serve listens on addr (see ListenAddr for the rule applied before) and
// serves the page of board until Close. A port in use is an error here.
func Serve(addr string, board *status.Board, log *slog.Logger) (*Server, error) {
	s, err := httpserve.Serve("FPT_STATUS_ADDR", addr, Handler(board), log)
	if err != nil {
		return nil, fmt.Errorf("statusweb: %w", err)
	}
	return &Server{s}, nil
}

// URL is the page's address, with the port chosen for port 0.
func (s *Server) URL() string { return "http://" + s.Addr() + "/" }
