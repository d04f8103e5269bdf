// Package kubernetes holds fpt's Kubernetes manifests and their test: no
// cluster runs here, so the test decodes every manifest strictly into the
// Kubernetes API types (an unknown or misspelled field fails it) and
// checks every pod the manifests make against what "fpt run" expects:
// its role and rank by launch/engine's mapping, one scheduler that every
// pod finds by its DNS name, the secret file mounted from a Secret, the
// probes on the metrics port, resources, and a grace period that covers a
// server's leave in order.
package kubernetes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/launch/engine"
	"github.com/fptps/fpt/node"
)

// jobSet is the part of JobSet's API (jobset.x-k8s.io/v1alpha2) the
// manifests use, with the API's field names and the Kubernetes types it
// embeds. The JobSet module (sigs.k8s.io/jobset) is not served by the Go
// module proxy this project builds from, so its types are mirrored here;
// a field the mirror lacks is refused like a misspelled one.
type jobSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ReplicatedJobs []struct {
			Name     string                  `json:"name"`
			Replicas int32                   `json:"replicas"`
			Template batchv1.JobTemplateSpec `json:"template"`
		} `json:"replicatedJobs"`
		Network *struct {
			EnableDNSHostnames       *bool  `json:"enableDNSHostnames"`
			Subdomain                string `json:"subdomain"`
			PublishNotReadyAddresses *bool  `json:"publishNotReadyAddresses"`
		} `json:"network"`
		FailurePolicy *struct {
			MaxRestarts int32 `json:"maxRestarts"`
		} `json:"failurePolicy"`
		SuccessPolicy *struct {
			Operator             string   `json:"operator"`
			TargetReplicatedJobs []string `json:"targetReplicatedJobs"`
		} `json:"successPolicy"`
	} `json:"spec"`
}

// pod is one pod a manifest makes: its spec and what Kubernetes gives it
// (hostname, annotations, the Indexed Job's JOB_COMPLETION_INDEX).
type pod struct {
	name        string // hostname
	subdomain   string
	spec        corev1.PodSpec
	annotations map[string]string
	index       int
}

// manifest is one file's objects, decoded.
type manifest struct {
	services []corev1.Service
	jobs     []batchv1.Job
	jobSets  []jobSet
}

// decode decodes the YAML documents of data strictly: a field the type
// does not have, or one given twice, is an error.
func decode(data []byte) (manifest, error) {
	var m manifest
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return m, fmt.Errorf("document %d: %w", i, err)
		}
		var meta metav1.TypeMeta
		if err := json.Unmarshal(js, &meta); err != nil {
			return m, fmt.Errorf("document %d: %w", i, err)
		}
		var into any
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 Service":
			m.services = append(m.services, corev1.Service{})
			into = &m.services[len(m.services)-1]
		case "batch/v1 Job":
			m.jobs = append(m.jobs, batchv1.Job{})
			into = &m.jobs[len(m.jobs)-1]
		case "jobset.x-k8s.io/v1alpha2 JobSet":
			m.jobSets = append(m.jobSets, jobSet{})
			into = &m.jobSets[len(m.jobSets)-1]
		default:
			return m, fmt.Errorf("document %d: no test for %s %s", i, meta.APIVersion, meta.Kind)
		}
		// Case-sensitive, as the API server reads it (encoding/json
		// would take "containerport" for containerPort).
		strict, err := sigsjson.UnmarshalStrict(js, into, sigsjson.DisallowUnknownFields)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil {
			return m, fmt.Errorf("document %d (%s): %w", i, meta.Kind, err)
		}
	}
	return m, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// pods lists the pods m's jobs make, as Kubernetes and JobSet name them.
func (m manifest) pods(t *testing.T) []pod {
	var out []pod
	for _, js := range m.jobSets {
		if js.Spec.Network == nil || js.Spec.Network.EnableDNSHostnames == nil || !*js.Spec.Network.EnableDNSHostnames {
			t.Errorf("JobSet %s: network.enableDNSHostnames is not true: pods get no DNS names", js.Name)
		}
		if n := js.Spec.Network; n != nil && n.PublishNotReadyAddresses != nil && !*n.PublishNotReadyAddresses {
			t.Errorf("JobSet %s: publishNotReadyAddresses false: the scheduler, not ready until the cluster runs, cannot be found", js.Name)
		}
		sub := js.Name
		if js.Spec.Network != nil && js.Spec.Network.Subdomain != "" {
			sub = js.Spec.Network.Subdomain
		}
		for _, rj := range js.Spec.ReplicatedJobs {
			for j := range int(rj.Replicas) {
				for i := range completions(t, rj.Template.Spec) {
					out = append(out, pod{name: fmt.Sprintf("%s-%s-%d-%d", js.Name, rj.Name, j, i), subdomain: sub,
						spec: rj.Template.Spec.Template.Spec, index: i,
						annotations: map[string]string{"jobset.sigs.k8s.io/jobset-name": js.Name, "jobset.sigs.k8s.io/replicatedjob-name": rj.Name}})
				}
			}
		}
	}
	for _, job := range m.jobs {
		sub := job.Spec.Template.Spec.Subdomain
		svc := m.service(sub)
		switch {
		case svc == nil:
			t.Errorf("Job %s: no headless Service %q for its pods' subdomain", job.Name, sub)
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			t.Errorf("Service %s is not headless (clusterIP %q)", svc.Name, svc.Spec.ClusterIP)
		case !svc.Spec.PublishNotReadyAddresses:
			t.Errorf("Service %s: publishNotReadyAddresses false: the scheduler, not ready until the cluster runs, cannot be found", svc.Name)
		case svc.Spec.Selector[batchv1.JobNameLabel] != job.Name:
			t.Errorf("Service %s selects %v, not the pods of Job %s", svc.Name, svc.Spec.Selector, job.Name)
		}
		for i := range completions(t, job.Spec) {
			out = append(out, pod{name: fmt.Sprintf("%s-%d", job.Name, i), subdomain: sub, spec: job.Spec.Template.Spec, index: i})
		}
	}
	return out
}

func (m manifest) service(name string) *corev1.Service {
	for i := range m.services {
		if m.services[i].Name == name {
			return &m.services[i]
		}
	}
	return nil
}

// completions is an Indexed Job's pod count, all running at once.
func completions(t *testing.T, s batchv1.JobSpec) int {
	if s.CompletionMode == nil || *s.CompletionMode != batchv1.IndexedCompletion {
		t.Errorf("a Job is not Indexed: its pods get no JOB_COMPLETION_INDEX")
		return 0
	}
	if s.Completions == nil || s.Parallelism == nil || *s.Parallelism != *s.Completions {
		t.Errorf("a Job's parallelism is not its completions: every node of an fpt job runs at once")
		return 0
	}
	return int(*s.Completions)
}

// env is the container's environment as the pod sees it: the manifest's
// values, fieldRefs to the pod's annotations, and what Kubernetes adds.
func (p pod) env(t *testing.T, c corev1.Container) map[string]string {
	env := map[string]string{"HOSTNAME": p.name, "JOB_COMPLETION_INDEX": strconv.Itoa(p.index)}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			m := regexp.MustCompile(`^metadata\.annotations\['([^']+)'\]$`).FindStringSubmatch(e.ValueFrom.FieldRef.FieldPath)
			if m == nil {
				t.Fatalf("%s: %s: a fieldRef the test does not know: %s", p.name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			v, ok := p.annotations[m[1]]
			if !ok {
				t.Errorf("%s: %s refers to annotation %s, which the pod lacks", p.name, e.Name, m[1])
			}
			env[e.Name] = v
		default:
			t.Fatalf("%s: %s: a valueFrom the test does not know", p.name, e.Name)
		}
	}
	return env
}

// node is what fpt run makes of a pod.
type nodeOf struct {
	pod  pod
	cfg  config.Config
	env  map[string]string
	plan engine.Plan
}

// check runs launch/engine's mapping and the configuration's parsing on
// every pod of m and checks the job they make.
func check(t *testing.T, m manifest) {
	pods := m.pods(t)
	if len(pods) == 0 {
		t.Fatal("no pods")
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []nodeOf
	for _, p := range pods {
		if len(p.spec.Containers) != 1 {
			t.Fatalf("%s: %d containers, want 1", p.name, len(p.spec.Containers))
		}
		c := p.spec.Containers[0]
		if len(c.Command) < 3 || c.Command[0] != "fpt" || c.Command[1] != "run" {
			t.Errorf("%s: command %q is not fpt run PROG", p.name, c.Command)
		}
		env := p.env(t, c)
		plan, err := engine.Detect(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatalf("%s: fpt run refuses it: %v", p.name, err)
		}
		if plan.Engine == "" {
			t.Fatalf("%s: fpt run finds no engine", p.name)
		}
		for _, kv := range plan.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		checkSecret(t, p, c, env["FPT_CLUSTER_SECRET_FILE"])
		checkUser(t, p)
		parsed := map[string]string{}
		for k, v := range env {
			parsed[k] = v
		}
		parsed["FPT_CLUSTER_SECRET_FILE"] = secret
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := parsed[k]; return v, ok })
		if err != nil {
			t.Fatalf("%s: the node refuses its environment: %v", p.name, err)
		}
		checkProbes(t, p, c, cfg)
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: no cpu and memory requests and memory limit", p.name)
		}
		if cfg.Role == node.Server {
			grace := int64(30)
			if p.spec.TerminationGracePeriodSeconds != nil {
				grace = *p.spec.TerminationGracePeriodSeconds
			}
			if float64(grace) <= cfg.LeaveTimeout.Seconds() {
				t.Errorf("%s: a grace period of %d s does not cover a server's leave in order (FPT_LEAVE_TIMEOUT %s)", p.name, grace, cfg.LeaveTimeout)
			}
		}
		nodes = append(nodes, nodeOf{pod: p, cfg: cfg, env: env, plan: plan})
	}
	checkJob(t, nodes)
}

// checkJob checks that the pods make one job: one scheduler, whose DNS
// name every pod has as DMLC_PS_ROOT_URI, the servers and workers each
// of a distinct rank from 0, as many as every pod says, and the workers
// with torchrun's variables.
func checkJob(t *testing.T, nodes []nodeOf) {
	first := nodes[0].cfg
	ranks := map[node.Role]map[int]bool{node.Server: {}, node.Worker: {}}
	var sched []string
	for _, n := range nodes {
		c := n.cfg
		if c.RootURI != first.RootURI || c.RootPort != first.RootPort || c.NumServers != first.NumServers || c.NumWorkers != first.NumWorkers {
			t.Errorf("%s: scheduler %s:%d, %d servers, %d workers; %s says %s:%d, %d, %d", n.pod.name, c.RootURI, c.RootPort,
				c.NumServers, c.NumWorkers, nodes[0].pod.name, first.RootURI, first.RootPort, first.NumServers, first.NumWorkers)
		}
		switch c.Role {
		case node.Scheduler:
			sched = append(sched, n.pod.name+"."+n.pod.subdomain)
			continue
		case node.Worker:
			for k, want := range map[string]string{"RANK": strconv.Itoa(c.Rank), "WORLD_SIZE": strconv.Itoa(c.NumWorkers), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"} {
				if n.env[k] != want {
					t.Errorf("%s: %s=%q, want %q", n.pod.name, k, n.env[k], want)
				}
			}
		}
		if c.RankVar == "" {
			t.Errorf("%s: no rank pinned", n.pod.name)
		}
		if ranks[c.Role][c.Rank] {
			t.Errorf("%s: a second %s of rank %d", n.pod.name, c.Role, c.Rank)
		}
		ranks[c.Role][c.Rank] = true
	}
	if len(sched) != 1 {
		t.Fatalf("schedulers %v, want one", sched)
	}
	if first.RootURI != sched[0] {
		t.Errorf("the pods look for the scheduler at %s; its pod is %s", first.RootURI, sched[0])
	}
	for role, want := range map[node.Role]int{node.Server: first.NumServers, node.Worker: first.NumWorkers} {
		for r := range want {
			if !ranks[role][r] {
				t.Errorf("no %s of rank %d (of %d)", role, r, want)
			}
		}
		if len(ranks[role]) != want {
			t.Errorf("%d %ss, want %d", len(ranks[role]), role, want)
		}
	}
}

// checkSecret checks that file is in a volume mounted from a Secret.
func checkSecret(t *testing.T, p pod, c corev1.Container, file string) {
	if file == "" {
		t.Errorf("%s: no FPT_CLUSTER_SECRET_FILE", p.name)
		return
	}
	for _, vm := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(vm.MountPath) {
			continue
		}
		for _, v := range p.spec.Volumes {
			if v.Name == vm.Name && v.Secret != nil && v.Secret.SecretName != "" {
				return
			}
		}
	}
	t.Errorf("%s: FPT_CLUSTER_SECRET_FILE=%s is not in a volume mounted from a Secret", p.name, file)
}

// checkUser checks the pod runs as a user other than root that can read
// the Secret's files: through its group (fsGroup), since Kubernetes makes
// them root's.
func checkUser(t *testing.T, p pod) {
	sc := p.spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.FSGroup == nil {
		t.Errorf("%s: not run as a user other than root with an fsGroup", p.name)
		return
	}
	for _, v := range p.spec.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o040 == 0) {
			t.Errorf("%s: the Secret's files are not readable by the pod's group", p.name)
		}
	}
}

// checkProbes checks the liveness and readiness probes ask the node's
// metrics port.
func checkProbes(t *testing.T, p pod, c corev1.Container, cfg config.Config) {
	_, port, err := net.SplitHostPort(cfg.MetricsAddr)
	if err != nil {
		t.Errorf("%s: FPT_METRICS_ADDR=%q: %v", p.name, cfg.MetricsAddr, err)
		return
	}
	for _, pr := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("%s: no probe of %s", p.name, pr.path)
			continue
		}
		got := pr.probe.HTTPGet.Port.String()
		for _, cp := range c.Ports {
			if cp.Name == got {
				got = strconv.Itoa(int(cp.ContainerPort))
			}
		}
		if got != port {
			t.Errorf("%s: the probe of %s asks port %s, the metrics are on %s", p.name, pr.path, got, port)
		}
	}
}

func manifests(t *testing.T) []string {
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests (%v)", err)
	}
	return files
}

func TestManifests(t *testing.T) {
	for _, f := range manifests(t) {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decode(data)
			if err != nil {
				t.Fatal(err)
			}
			check(t, m)
		})
	}
}

// A misspelled or unknown field fails the decoding: the test would catch
// one in a manifest.
func TestMisspelledFieldRefused(t *testing.T) {
	for _, f := range manifests(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct{ from, to string }{
			{"terminationGracePeriodSeconds:", "terminationGracePeriodSecond:"},
			{"readinessProbe:", "readinesProbe:"},
			{"containerPort:", "containerport:"},
			{"completionMode:", "completionmode:"},
			{"secretName:", "secretname:"},
			{"publishNotReadyAddresses:", "publishNotReadyAddress:"},
		} {
			if !bytes.Contains(data, []byte(tt.from)) {
				continue
			}
			bad := bytes.Replace(data, []byte(tt.from), []byte(tt.to), 1)
			if _, err := decode(bad); err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(tt.to, ":")) {
				t.Errorf("%s with %s misspelled %s: decoded (%v)", f, tt.from, tt.to, err)
			}
		}
	}
}
