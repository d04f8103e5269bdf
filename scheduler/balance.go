package scheduler

import (
	"fmt"
	"strings"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// startLB makes the load balancer and grants the first horizon. The LB's
// decisions are lb.Balancer's; the scheduler only carries its samples in
// and its directives out, and logs every decision with its reason.
func (c *core) startLB() error {
	cfg := lb.Config{ProbeEvery: c.cfg.LBProbeEvery, Fixed: !c.cfg.LB, AheadFor: c.cfg.LBAhead, Hosts: c.lbHosts()}
	if cfg.AheadFor == 0 {
		cfg.AheadFor = -1 // Lookahead only
	}
	for _, info := range c.table {
		switch info.Role {
		case node.Server:
			cfg.Servers = append(cfg.Servers, info.ID)
		case node.Worker:
			cfg.Workers = append(cfg.Workers, info.ID)
		}
	}
	b, err := lb.NewBalancer(cfg)
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	c.lb = b
	c.direct(b.Start())
	return nil
}

// report feeds a node's sample to the LB and sends what it directs.
func (c *core) report(m *control.Message) {
	if c.lb == nil {
		c.log.Warn("lb: report while the LB is off", "from", m.Sender)
		return
	}
	sample, err := lb.UnmarshalSample(m.Body)
	if err != nil || sample.Node != m.Sender {
		c.log.Warn("lb: bad report ignored", "from", m.Sender, "err", err)
		return
	}
	ds := c.lb.Observe(sample, c.now)
	for _, d := range lb.Coalesce(ds) {
		c.direct(d)
	}
	c.directed(ds)
}

// direct sends a directive to every worker but those still joining, and
// to every server that needs it (lb.Directive.ForServers).
func (c *core) direct(d lb.Directive) {
	if d.Decision != nil {
		c.log.Info("lb decision", "version", d.Decision.Version, "from_iteration", d.Decision.Iteration,
			"state", c.lb.State(), "split", d.String(), "reason", d.Reason)
		if c.writeDecision(d) {
			c.out.decisions = append(c.out.decisions, DecisionLine(d))
		}
	}
	body, err := d.MarshalBinary()
	if err != nil {
		c.log.Error("lb: directive not encodable", "err", err)
		return
	}
	servers := d.ForServers(c.serversDirected, c.serversShaping)
	if servers {
		c.serversDirected, c.serversShaping = true, d.Shaping
	}
	for _, info := range c.table[1:] {
		if info.Role == node.Server && !servers {
			continue
		}
		if _, joining := c.joining[info.ID]; joining && info.Role == node.Worker {
			// Its first directive is the decision that counts it
			// (admitWorker): those before concern iterations it never
			// pushes, and their decisions' versions would leave a gap.
			continue
		}
		c.send(info.ID, &control.Message{Command: control.Decision, Sender: node.SchedulerID, Body: body})
	}
}

// quietShareStep is how far an aggregator's share must move from the last
// decision line written before a new split gets one at PS_VERBOSE=0: each
// probe's measurements differ a little, and so do the splits balanced
// from them.
const quietShareStep = 0.05

// writeDecision says whether d, a directive with a decision, gets a line
// on the decisions writer. At PS_VERBOSE 1 and above every decision does.
// At 0 only those that change what the job settles on do: a decision that
// moves a worker or retries, or one whose aggregators differ from the
// last line's, or whose shares moved by more than quietShareStep. Probes,
// the fall-backs after failed ones and the splits that only drift are
// left to the log: an LB that probes every few iterations would otherwise
// write a line each time (megabytes an hour).
func (c *core) writeDecision(d lb.Directive) bool {
	if c.cfg.Verbose < 1 {
		if d.Probe {
			return false
		}
		if d.Decision.Workers == nil && !d.Retry && c.written != nil && c.written.SplitWithin(*d.Decision, quietShareStep) {
			return false
		}
	}
	c.written = d.Decision
	return true
}

// decisionLinePrefix starts every line DecisionLine writes.
const decisionLinePrefix = "lb decision "

// DecisionLine is the line (without its newline) the scheduler writes to
// Run's decisions writer for a directive that carries a new decision, as
// "lb decision v2 from iteration 7: S0 80.0%, W1 20.0% (reason)". Programs
// that count decisions read it back with ParseDecisionLine.
func DecisionLine(d lb.Directive) string { return decisionLinePrefix + d.String() }

// ParseDecisionLine reads a line DecisionLine wrote (surrounding spaces
// allowed) and returns the decision's version and first iteration; ok is
// false for any other line.
func ParseDecisionLine(line string) (version uint32, fromIteration uint64, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), decisionLinePrefix)
	if !found {
		return 0, 0, false
	}
	var colon string
	if n, err := fmt.Sscanf(rest, "v%d from iteration %d%1s", &version, &fromIteration, &colon); n != 3 || err != nil || colon != ":" {
		return 0, 0, false
	}
	return version, fromIteration, true
}
