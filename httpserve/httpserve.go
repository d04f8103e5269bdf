// Package httpserve serves one HTTP handler on a listening address until
// closed: what a node's metrics (FPT_METRICS_ADDR) and the scheduler's
// status page (FPT_STATUS_ADDR) both need.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Server serves a handler until Close.
type Server struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

// Serve listens on addr ("host:port"; port 0 picks one) and serves h until
// Close. A port in use is an error here, not later; what names the setting
// in that error (as "FPT_METRICS_ADDR").
func Serve(what, addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s := &Server{
		addr: l.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("http server stopped", "setting", what, "err", err)
		}
	}()
	return s, nil
}

// Addr is the address being served (with the port chosen for port 0).
func (s *Server) Addr() string { return s.addr }

// Close stops serving, letting a request in progress finish briefly.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
