from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxnMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_MODE_UNSPECIFIED: _ClassVar[TxnMode]
    INCREMENTAL: _ClassVar[TxnMode]
    GANG: _ClassVar[TxnMode]

class Detection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DETECTION_UNSPECIFIED: _ClassVar[Detection]
    FINE: _ClassVar[Detection]
    COARSE: _ClassVar[Detection]
TXN_MODE_UNSPECIFIED: TxnMode
INCREMENTAL: TxnMode
GANG: TxnMode
DETECTION_UNSPECIFIED: Detection
FINE: Detection
COARSE: Detection

class Fallback(_message.Message):
    __slots__ = ("machine", "seen_seq")
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    SEEN_SEQ_FIELD_NUMBER: _ClassVar[int]
    machine: str
    seen_seq: int
    def __init__(self, machine: _Optional[str] = ..., seen_seq: _Optional[int] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("job", "index", "machine", "seen_seq", "evict", "resources", "fallbacks", "moves_from")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    SEEN_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FROM_FIELD_NUMBER: _ClassVar[int]
    job: str
    index: int
    machine: str
    seen_seq: int
    evict: _containers.RepeatedScalarFieldContainer[str]
    resources: _containers.ScalarMap[str, float]
    fallbacks: _containers.RepeatedCompositeFieldContainer[Fallback]
    moves_from: str
    def __init__(self, job: _Optional[str] = ..., index: _Optional[int] = ..., machine: _Optional[str] = ..., seen_seq: _Optional[int] = ..., evict: _Optional[_Iterable[str]] = ..., resources: _Optional[_Mapping[str, float]] = ..., fallbacks: _Optional[_Iterable[_Union[Fallback, _Mapping]]] = ..., moves_from: _Optional[str] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("scheduler", "instance", "claims", "mode", "detection", "job")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    claims: _containers.RepeatedCompositeFieldContainer[Claim]
    mode: TxnMode
    detection: Detection
    job: str
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., claims: _Optional[_Iterable[_Union[Claim, _Mapping]]] = ..., mode: _Optional[_Union[TxnMode, str]] = ..., detection: _Optional[_Union[Detection, str]] = ..., job: _Optional[str] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("transaction", "transactions")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    transactions: _containers.RepeatedCompositeFieldContainer[Transaction]
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ..., transactions: _Optional[_Iterable[_Union[Transaction, _Mapping]]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("claim", "reason", "detail", "dimension")
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    claim: int
    reason: str
    detail: str
    dimension: str
    def __init__(self, claim: _Optional[int] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., dimension: _Optional[str] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("committed", "rejected", "revision", "evicted", "attempts", "machines", "results")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    committed: _containers.RepeatedScalarFieldContainer[int]
    rejected: _containers.RepeatedCompositeFieldContainer[Rejection]
    revision: int
    evicted: _containers.RepeatedScalarFieldContainer[str]
    attempts: int
    machines: _containers.RepeatedScalarFieldContainer[str]
    results: _containers.RepeatedCompositeFieldContainer[CommitResponse]
    def __init__(self, committed: _Optional[_Iterable[int]] = ..., rejected: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., revision: _Optional[int] = ..., evicted: _Optional[_Iterable[str]] = ..., attempts: _Optional[int] = ..., machines: _Optional[_Iterable[str]] = ..., results: _Optional[_Iterable[_Union[CommitResponse, _Mapping]]] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("start_revision",)
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    start_revision: int
    def __init__(self, start_revision: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("key", "value", "mod_revision", "create_revision", "deleted")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    deleted: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., mod_revision: _Optional[int] = ..., create_revision: _Optional[int] = ..., deleted: _Optional[bool] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("snapshot", "snapshot_done", "reset", "revision", "records")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DONE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    snapshot: bool
    snapshot_done: bool
    reset: bool
    revision: int
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, snapshot: _Optional[bool] = ..., snapshot_done: _Optional[bool] = ..., reset: _Optional[bool] = ..., revision: _Optional[int] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec_json", "allow_unknown_scheduler")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNKNOWN_SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    spec_json: bytes
    allow_unknown_scheduler: bool
    def __init__(self, spec_json: _Optional[bytes] = ..., allow_unknown_scheduler: _Optional[bool] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "revision")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    job: str
    revision: int
    def __init__(self, job: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job", "min_revision")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    job: str
    min_revision: int
    def __init__(self, job: _Optional[str] = ..., min_revision: _Optional[int] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("index", "state", "machine", "has_exit_code", "exit_code", "started_at", "ended_at", "detail", "placed_at", "scheduler")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: str
    machine: str
    has_exit_code: bool
    exit_code: int
    started_at: float
    ended_at: float
    detail: str
    placed_at: float
    scheduler: str
    def __init__(self, index: _Optional[int] = ..., state: _Optional[str] = ..., machine: _Optional[str] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., detail: _Optional[str] = ..., placed_at: _Optional[float] = ..., scheduler: _Optional[str] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("spec_json", "state", "reason", "task_states", "tasks", "revision", "why_json")
    class TaskStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_STATES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    WHY_JSON_FIELD_NUMBER: _ClassVar[int]
    spec_json: bytes
    state: str
    reason: str
    task_states: _containers.ScalarMap[str, int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    revision: int
    why_json: bytes
    def __init__(self, spec_json: _Optional[bytes] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., task_states: _Optional[_Mapping[str, int]] = ..., tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., revision: _Optional[int] = ..., why_json: _Optional[bytes] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("scheduler", "state", "limit", "newest_first", "min_revision")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    state: str
    limit: int
    newest_first: bool
    min_revision: int
    def __init__(self, scheduler: _Optional[str] = ..., state: _Optional[str] = ..., limit: _Optional[int] = ..., newest_first: _Optional[bool] = ..., min_revision: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "revision")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    revision: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class KillJobRequest(_message.Message):
    __slots__ = ("job", "reason", "by")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    job: str
    reason: str
    by: str
    def __init__(self, job: _Optional[str] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class KillJobResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class SetJobStatusRequest(_message.Message):
    __slots__ = ("job", "state", "reason", "by", "at")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    job: str
    state: str
    reason: str
    by: str
    at: float
    def __init__(self, job: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class SetJobStatusResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class ResizeJobRequest(_message.Message):
    __slots__ = ("job", "task_count")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    job: str
    task_count: int
    def __init__(self, job: _Optional[str] = ..., task_count: _Optional[int] = ...) -> None: ...

class ResizeJobResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class SetMachineStateRequest(_message.Message):
    __slots__ = ("machine", "action")
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    machine: str
    action: str
    def __init__(self, machine: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class SetMachineStateResponse(_message.Message):
    __slots__ = ("revision", "state", "tasks_lost")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_LOST_FIELD_NUMBER: _ClassVar[int]
    revision: int
    state: str
    tasks_lost: int
    def __init__(self, revision: _Optional[int] = ..., state: _Optional[str] = ..., tasks_lost: _Optional[int] = ...) -> None: ...

class SetLimitsRequest(_message.Message):
    __slots__ = ("scheduler", "changes_json")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    changes_json: bytes
    def __init__(self, scheduler: _Optional[str] = ..., changes_json: _Optional[bytes] = ...) -> None: ...

class SetLimitsResponse(_message.Message):
    __slots__ = ("revision", "limits_json")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_JSON_FIELD_NUMBER: _ClassVar[int]
    revision: int
    limits_json: bytes
    def __init__(self, revision: _Optional[int] = ..., limits_json: _Optional[bytes] = ...) -> None: ...

class ListMachinesRequest(_message.Message):
    __slots__ = ("state", "limit", "min_revision")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    state: str
    limit: int
    min_revision: int
    def __init__(self, state: _Optional[str] = ..., limit: _Optional[int] = ..., min_revision: _Optional[int] = ...) -> None: ...

class MachineInfo(_message.Message):
    __slots__ = ("machine_json", "used", "tasks", "seq")
    class UsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MACHINE_JSON_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    machine_json: bytes
    used: _containers.ScalarMap[str, float]
    tasks: int
    seq: int
    def __init__(self, machine_json: _Optional[bytes] = ..., used: _Optional[_Mapping[str, float]] = ..., tasks: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class ListMachinesResponse(_message.Message):
    __slots__ = ("machines", "revision")
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    machines: _containers.RepeatedCompositeFieldContainer[MachineInfo]
    revision: int
    def __init__(self, machines: _Optional[_Iterable[_Union[MachineInfo, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("min_revision",)
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    min_revision: int
    def __init__(self, min_revision: _Optional[int] = ...) -> None: ...

class SchedulerStatus(_message.Message):
    __slots__ = ("scheduler", "instance", "metrics_json")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    metrics_json: bytes
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., metrics_json: _Optional[bytes] = ...) -> None: ...

class CellStatus(_message.Message):
    __slots__ = ("revision", "machines_up", "machines_down", "capacity", "used", "jobs", "tasks", "schedulers", "agents", "server", "etcd_json", "limits_json")
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class JobsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class TasksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MACHINES_UP_FIELD_NUMBER: _ClassVar[int]
    MACHINES_DOWN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULERS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    ETCD_JSON_FIELD_NUMBER: _ClassVar[int]
    LIMITS_JSON_FIELD_NUMBER: _ClassVar[int]
    revision: int
    machines_up: int
    machines_down: int
    capacity: _containers.ScalarMap[str, float]
    used: _containers.ScalarMap[str, float]
    jobs: _containers.ScalarMap[str, int]
    tasks: _containers.ScalarMap[str, int]
    schedulers: _containers.RepeatedCompositeFieldContainer[SchedulerStatus]
    agents: int
    server: str
    etcd_json: bytes
    limits_json: bytes
    def __init__(self, revision: _Optional[int] = ..., machines_up: _Optional[int] = ..., machines_down: _Optional[int] = ..., capacity: _Optional[_Mapping[str, float]] = ..., used: _Optional[_Mapping[str, float]] = ..., jobs: _Optional[_Mapping[str, int]] = ..., tasks: _Optional[_Mapping[str, int]] = ..., schedulers: _Optional[_Iterable[_Union[SchedulerStatus, _Mapping]]] = ..., agents: _Optional[int] = ..., server: _Optional[str] = ..., etcd_json: _Optional[bytes] = ..., limits_json: _Optional[bytes] = ...) -> None: ...

class RegisterInstanceRequest(_message.Message):
    __slots__ = ("scheduler", "instance", "policy", "started_at", "ttl")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    policy: str
    started_at: float
    ttl: int
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., policy: _Optional[str] = ..., started_at: _Optional[float] = ..., ttl: _Optional[int] = ...) -> None: ...

class RegisterInstanceResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    def __init__(self, lease: _Optional[int] = ...) -> None: ...

class DeregisterInstanceRequest(_message.Message):
    __slots__ = ("scheduler", "instance", "lease")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    lease: int
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., lease: _Optional[int] = ...) -> None: ...

class DeregisterInstanceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    def __init__(self, lease: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("ttl",)
    TTL_FIELD_NUMBER: _ClassVar[int]
    ttl: int
    def __init__(self, ttl: _Optional[int] = ...) -> None: ...

class ReportMetricsRequest(_message.Message):
    __slots__ = ("scheduler", "instance", "lease", "metrics_json")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    lease: int
    metrics_json: bytes
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., lease: _Optional[int] = ..., metrics_json: _Optional[bytes] = ...) -> None: ...

class ReportMetricsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PendingReport(_message.Message):
    __slots__ = ("job", "report_json")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    job: str
    report_json: bytes
    def __init__(self, job: _Optional[str] = ..., report_json: _Optional[bytes] = ...) -> None: ...

class ReportPendingRequest(_message.Message):
    __slots__ = ("scheduler", "instance", "lease", "reports")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    instance: str
    lease: int
    reports: _containers.RepeatedCompositeFieldContainer[PendingReport]
    def __init__(self, scheduler: _Optional[str] = ..., instance: _Optional[str] = ..., lease: _Optional[int] = ..., reports: _Optional[_Iterable[_Union[PendingReport, _Mapping]]] = ...) -> None: ...

class ReportPendingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterAgentRequest(_message.Message):
    __slots__ = ("agent", "machines_json", "ttl", "lease")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MACHINES_JSON_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    agent: str
    machines_json: _containers.RepeatedScalarFieldContainer[bytes]
    ttl: int
    lease: int
    def __init__(self, agent: _Optional[str] = ..., machines_json: _Optional[_Iterable[bytes]] = ..., ttl: _Optional[int] = ..., lease: _Optional[int] = ...) -> None: ...

class RegisterAgentResponse(_message.Message):
    __slots__ = ("lease", "revision")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease: int
    revision: int
    def __init__(self, lease: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class ReportTaskRequest(_message.Message):
    __slots__ = ("task", "outcome", "agent", "machine", "has_exit_code", "exit_code", "started_at", "ended_at", "detail")
    TASK_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    task: str
    outcome: str
    agent: str
    machine: str
    has_exit_code: bool
    exit_code: int
    started_at: float
    ended_at: float
    detail: str
    def __init__(self, task: _Optional[str] = ..., outcome: _Optional[str] = ..., agent: _Optional[str] = ..., machine: _Optional[str] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class ReportTaskResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...
