"""costs.pricing keys the shared prices by value; the last cluster and assumptions met are held and their keys reused
for the very same object only: another object (another value, or an equal one) gets its own key, made anew."""

from commtax.costs import pricing
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job

JOB = "examples/llama2-70b-h100.yaml"


def test_the_cluster_key_is_each_clusters_own_json_whichever_came_last():
    job = load_job(JOB)
    other = job.cluster.model_copy(update={"num_gpus": job.cluster.num_gpus * 2})
    for c in (job.cluster, other, job.cluster, other):
        assert pricing.cluster_key(c) == c.model_dump_json()
    assert pricing.cluster_key(job.cluster) != pricing.cluster_key(other)


def test_alternating_clusters_price_as_each_does_alone():
    """A sweep that alternates two clusters of one layout (the held key changes at every plan: a slower network)
    gets each one's own step time, as estimated alone."""
    job = load_job(JOB)
    slow_net = job.cluster.inter_node.model_copy(update={"bw_Gbps": job.cluster.inter_node.bw_Gbps / 4})
    slow = job_with(job.model_copy(update={"cluster": job.cluster.model_copy(update={"inter_node": slow_net})}))
    alone = [estimate(j).to_dict() for j in (job, slow)]
    for _ in range(2):
        assert [estimate(j).to_dict() for j in (job, slow)] == alone
    assert alone[0]["step_time_s"] < alone[1]["step_time_s"]
