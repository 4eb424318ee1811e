// baton's checks of the Job that runs an elastic job (docs/deploy.md,
// Elastic jobs): how Kubernetes replaces a pod whose trainers died, and how
// the Job ends. Called from checks.mjs for every batonrun Job whose
// --min-nodes (or BATON_MIN_NODES) is below --nodes.

// The Job of an elastic batonrun job (--min-nodes below --nodes): a pod
// whose trainers die is replaced and joins again, and the Job completes
// even when a node is lost for good. `where` names the Job in messages,
// `container` is batonrun's container; returns error messages.
export function checkElasticJob(job, where, container, minNodes) {
  const errors = [];
  const backoff = job.spec.backoffLimit ?? 6;
  if (backoff < 1) {
    errors.push(`${where}: backoffLimit ${backoff} fails the Job when the first trainer dies; in an elastic job (--min-nodes=${minNodes}) that pod is replaced and joins again: allow some failures`);
  }
  // The exit codes batonrun gives a pod whose trainer failed: 1.
  const matches = (rule, code) => {
    const req = rule.onExitCodes;
    if (!req || (req.containerName && req.containerName !== container)) return false;
    const listed = (req.values ?? []).includes(code);
    return req.operator === "NotIn" ? !listed : listed;
  };
  (job.spec.podFailurePolicy?.rules ?? []).forEach((rule, i) => {
    if (["FailJob", "FailIndex"].includes(rule.action) && matches(rule, 1)) {
      errors.push(`${where}: podFailurePolicy rule ${i} (${rule.action}) matches exit code 1, batonrun's for a trainer that died: in an elastic job that pod is replaced and joins again`);
    }
  });
  const rules = job.spec.successPolicy?.rules ?? [];
  if (rules.length === 0) {
    errors.push(`${where}: no successPolicy: when a node is lost for good its index never succeeds and the Job never completes; add successPolicy.rules: [{succeededCount: ${minNodes}}] (the job ends on at least --min-nodes nodes, all at once)`);
  }
  rules.forEach((rule, i) => {
    if (rule.succeededIndexes !== undefined) {
      errors.push(`${where}: successPolicy rule ${i} names succeededIndexes "${rule.succeededIndexes}": completion indexes are not baton's ranks, and any node can be the one lost; use succeededCount alone`);
    }
    if (rule.succeededCount !== undefined && rule.succeededCount > minNodes) {
      errors.push(`${where}: successPolicy rule ${i}: succeededCount ${rule.succeededCount} exceeds --min-nodes=${minNodes}: a job that ends on ${minNodes} nodes would never complete`);
    }
  });
  return errors;
}
