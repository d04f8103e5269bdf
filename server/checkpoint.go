package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fptps/fpt/kvstore"
)

// checkpointPath is the checkpoint of the server of rank: a job restarted
// with the same number of servers gives every rank its own file back.
func checkpointPath(dir string, rank int) string {
	return filepath.Join(dir, "server-"+strconv.Itoa(rank)+".ckpt")
}

// checkDir refuses, before the server joins, a checkpoint directory that
// is not one: failing later would stop the whole cluster.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil && !fi.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		return fmt.Errorf("server: FPT_CHECKPOINT_DIR %s: %w", dir, err)
	}
	return nil
}

// loadCheckpoint reads the store saved at path; no file is an empty
// store (the job's first start). A file that is there but unreadable,
// torn or corrupted is an error naming it: starting empty would silently
// throw the saved values away.
func loadCheckpoint(path string) (*kvstore.Store, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return kvstore.New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("server: checkpoint %s: %w", path, err)
	}
	s, err := kvstore.Load(b)
	if err != nil {
		return nil, fmt.Errorf("server: checkpoint %s (move it away to start empty): %w", path, err)
	}
	return s, nil
}

// writeAtomic replaces path with data so that a crash at any moment
// leaves either the old file or the new one, whole: the data goes to a
// temporary file in the same directory, is synced, renamed over path, and
// the directory is synced so that the rename itself survives.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("server: checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
			err = fmt.Errorf("server: checkpoint %s: %w", path, err)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkpointer writes the store every interval if it changed, and once
// more when stopped.
type checkpointer struct {
	path     string
	snapshot func(force bool) (data []byte, changed bool, err error)
	log      *slog.Logger
	failed   bool // the last write failed: the next one writes even if nothing changed
	quit     chan struct{}
	done     chan struct{}
	haltOnce sync.Once
}

func startCheckpointer(path string, every time.Duration, snapshot func(force bool) ([]byte, bool, error), log *slog.Logger) *checkpointer {
	c := &checkpointer{path: path, snapshot: snapshot, log: log, quit: make(chan struct{}), done: make(chan struct{})}
	go c.loop(every)
	return c
}

func (c *checkpointer) loop(every time.Duration) {
	defer close(c.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			// A failed periodic checkpoint does not stop training: the
			// next tick (or the last one) tries again.
			if err := c.write(); err != nil {
				c.log.Warn("checkpoint failed", "err", err)
			}
		case <-c.quit:
			return
		}
	}
}

// write saves the store if it changed since the last write.
func (c *checkpointer) write() error {
	data, changed, err := c.snapshot(c.failed)
	if err != nil || !changed {
		return err
	}
	if err := writeAtomic(c.path, data); err != nil {
		c.failed = true
		return err
	}
	c.failed = false
	c.log.Debug("checkpoint written", "file", c.path, "bytes", len(data))
	return nil
}

// halt ends the periodic writes; it may be called again.
func (c *checkpointer) halt() {
	c.haltOnce.Do(func() {
		close(c.quit)
		<-c.done
	})
}

// stop ends the periodic writes and, if last, writes a final checkpoint.
func (c *checkpointer) stop(last bool) error {
	c.halt()
	if !last {
		return nil
	}
	return c.write()
}
